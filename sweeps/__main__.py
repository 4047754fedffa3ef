from sweeps._cli import cli

cli()
