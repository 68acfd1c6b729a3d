"""One module per `podium` command (see podium_app/cli.py)."""
