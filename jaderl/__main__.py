"""``python -m jaderl``: the ``jaderl`` command (e.g. under ``torchrun ... -m jaderl train ...``)."""

from jaderl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
