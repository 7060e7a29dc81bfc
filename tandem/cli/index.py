"""`tandem index ...`: build and query retrieval indexes. Filled by the retrieval work."""

import typer

app = typer.Typer(no_args_is_help=True)
