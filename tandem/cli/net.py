"""`tandem net ...`: emulated network (namespaces + delay proxy). Filled by the transport work."""

import typer

app = typer.Typer(no_args_is_help=True)
