"""``python -m codemode_worker``: serve exactly one program over stdin/stdout, then exit."""

from .entry import run

if __name__ == "__main__":
    run()
