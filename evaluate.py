"""`python evaluate.py`: the program in fbat_cli/evaluate.py, installed also as `fbat-evaluate`; its
docstring and --help say what it does."""

from fbat_cli.evaluate import run_program

if __name__ == "__main__":
    run_program()
