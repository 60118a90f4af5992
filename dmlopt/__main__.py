"""`python -m dmlopt` is the `dmlopt` command."""

import sys

from dmlopt.cli.launch import main

sys.exit(main())
