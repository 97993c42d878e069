"""Layer 6, cli: the `xtrain` command line (`main`), one module per command.

Each command module has `configure_parser(parser)` and `run(args) -> int`, and only parses
arguments and calls the layers below; no engine logic lives here. May import every layer.
"""
