"""``cosmicac keys``: show the identity kept in a storage folder."""

from __future__ import annotations

from pathlib import Path

import typer

from p2p.errors import P2PError
from p2p.keys import load_or_create_keypair

from ._console import OutputFormat, fail, print_json

app = typer.Typer(help="Identities (Ed25519 key pairs).", no_args_is_help=True)


@app.command("show")
def show(
    storage: Path = typer.Option(
        ..., "--storage", envvar="COSMICAC_STORAGE",
        help="Storage folder; the identity is created there if absent.",
    ),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o"),
) -> None:
    """Print the public key of the identity in STORAGE (creating it if absent).

    Example: cosmicac keys show --storage ~/.config/cosmicac/user -o json
    """
    try:
        keypair = load_or_create_keypair(storage)
    except P2PError as exc:
        fail(str(exc))
    except OSError as exc:  # anything the identity's own errors did not name
        fail(f"cannot use storage folder {storage}: {exc.strerror or exc}")
    if output is OutputFormat.json:
        print_json({"public_key": keypair.hex, "storage": str(storage.resolve())})
    else:
        typer.echo(keypair.hex)
