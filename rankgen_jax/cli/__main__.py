from rankgen_jax.cli.console import console_main

raise SystemExit(console_main())
