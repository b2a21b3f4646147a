"""`python train.py`: the program in fbat_cli/train.py, installed also as `fbat-train`; its
docstring and --help say what it does."""

from fbat_cli.train import run_program

if __name__ == "__main__":
    run_program()
