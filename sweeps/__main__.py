from sweeps.commands import cli

cli()
