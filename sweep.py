"""`python sweep.py`: the program in fbat_cli/sweep.py, installed also as `fbat-sweep`; its
docstring and --help say what it does."""

from fbat_cli.sweep import run_program

if __name__ == "__main__":
    run_program()
