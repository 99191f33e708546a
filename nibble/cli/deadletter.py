"""``nibble deadletter list|show|replay``: inspect the dead-letter stream and replay entries once fixed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from google.protobuf.json_format import MessageToDict

from nibble.cli.app import app, user_errors

deadletter_app = typer.Typer(help="Inspect the dead-letter stream; replay entries whose cause is fixed.")
app.add_typer(deadletter_app, name="deadletter")

ConfigOption = Annotated[Path | None, typer.Option("--config", help="run configuration (YAML); `redis` is read")]
UrlOption = Annotated[str | None, typer.Option("--redis-url", help="override redis.url")]


def _connect(config_path: Path | None, redis_url: str | None):
    from nibble.config import load
    from nibble.transport.stream import connect

    config = load(config_path).redis
    if redis_url is not None:
        config = config.model_copy(update={"url": redis_url})
    return connect(config), config


@deadletter_app.command("list")
@user_errors
def list_command(
    config: ConfigOption = None,
    redis_url: UrlOption = None,
    count: Annotated[int, typer.Option(min=1, help="at most this many, oldest first")] = 100,
    reason: Annotated[str | None, typer.Option(help="only this reason code, e.g. token_out_of_vocab")] = None,
) -> None:
    """One line per dead-letter entry: its id, reason code, original id, size and detail."""
    from nibble.transport.stream.deadletter import list_dead_letters

    client, redis_config = _connect(config, redis_url)
    letters = [x for x in list_dead_letters(client, redis_config, count) if reason in (None, x.code)]
    for x in letters:
        typer.echo(f"{x.entry_id}  {x.code:<24} from {x.original_id}  {len(x.payload)} B  {x.reason}")
    typer.echo(f"{len(letters)} entries in {redis_config.dead_letter_stream}", err=True)


@deadletter_app.command("show")
@user_errors
def show_command(
    entry_id: Annotated[str, typer.Argument(help="a dead-letter entry id (from `list`)")],
    config: ConfigOption = None,
    redis_url: UrlOption = None,
) -> None:
    """The entry's reason and its payload decoded as a trajectory group (JSON), or its size when it does not
    decode."""
    from nibble.transport.stream.deadletter import get_dead_letter

    client, redis_config = _connect(config, redis_url)
    letter = get_dead_letter(client, redis_config, entry_id)
    group = letter.group()
    record = {"entry_id": letter.entry_id, "original_id": letter.original_id, "reason": letter.reason}
    if group is None:
        record["payload"] = f"{len(letter.payload)} bytes that do not decode as a TrajectoryGroup"
    else:
        record["group"] = MessageToDict(group, preserving_proto_field_name=True)
    typer.echo(json.dumps(record, indent=2))


@deadletter_app.command("replay")
@user_errors
def replay_command(
    entry_ids: Annotated[list[str] | None, typer.Argument(help="dead-letter entry ids; none: every entry")] = None,
    config: ConfigOption = None,
    redis_url: UrlOption = None,
    reason: Annotated[str | None, typer.Option(help="only entries with this reason code")] = None,
) -> None:
    """Put entries back on the trajectory stream (the trainer checks them again: one still unusable comes
    back here) and remove them from the dead-letter stream."""
    from nibble.transport.stream.deadletter import get_dead_letter, list_dead_letters, replay

    client, redis_config = _connect(config, redis_url)
    if entry_ids:
        letters = [get_dead_letter(client, redis_config, i) for i in entry_ids]
    else:
        letters = list_dead_letters(client, redis_config, count=redis_config.dead_letter_max_entries)
    letters = [x for x in letters if reason in (None, x.code)]
    for letter, new_id in zip(letters, replay(client, redis_config, letters), strict=True):
        typer.echo(f"{letter.entry_id} -> {redis_config.stream} {new_id}")
    typer.echo(f"replayed {len(letters)} entries", err=True)
