"""One module per `coreopt` command, each with `register(app)`."""
