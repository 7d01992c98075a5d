"""`python -m trainer ...` (see trainer/cli.py)."""

import sys

from trainer.cli import main

sys.exit(main())
