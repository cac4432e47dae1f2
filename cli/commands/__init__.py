"""The ``sessionfold`` subcommands, one module per area (each has ``register(subparsers)``)."""
