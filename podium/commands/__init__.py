"""One module per `podium` command (see podium/cli.py)."""
