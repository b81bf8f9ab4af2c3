"""`python -m arithmech.cli ...` (for `accelerate launch -m arithmech.cli finetune ...`)."""

import sys

from arithmech.cli import main

sys.exit(main())
