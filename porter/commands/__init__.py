"""What the porter command's subcommands do beyond loading a port: one run end to end,
batches, the server and its jobs and uploads, bench, verify, inspect and new (the CLI
itself is ``porter.cli``)."""
