import sys

from rankgen_jax.cli.main import main

sys.exit(main())
