"""`cosmicac db`: two replicas (real processes, the group's smoke test) converge; status
and verify agree. The one-shot commands (status, verify, add-writer...) run in this
process; ``db serve`` stays a process wherever the test is about it (the replicas that
only ask a creator for its data, in the readers test, run here as ``db serve`` runs
one)."""

import functools
import json
import logging
import os
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

import pytest
import trio

from crdt import (
    FsyncPolicy,
    PutApiKey,
    PutModelMaster,
    ReplicationConfig,
    hash_secret,
    run_database_service,
)
from crdt._base import Base
from p2p.keys import format_key, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig
from tests.crdt.helpers import usage_ops
from tests.p2p.helpers import wait_until

from .helpers import process, read_until
from .support import cosmicac as in_process
from .support import dht_node, invoke

pytestmark = pytest.mark.slow


async def cosmicac(*args, env=None):
    """``cosmicac *args`` in this process: (exit status, stdout, stderr)."""
    result = await in_process(*args, env=env)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def status(storage) -> dict:
    code, out, err = await cosmicac("db", "status", "--storage", str(storage), "-o", "json")
    assert code == 0, err
    return json.loads(out)


def seed_creator(storage) -> str:
    keypair = load_or_create_keypair(storage)
    with Base.open(storage, keypair, fsync=FsyncPolicy.NEVER) as base:
        base.append(usage_ops("k1", 200))
        base.append([[PutModelMaster("llama-3-8b", "vllm", {"max_tokens": 1024})],
                     [PutApiKey("key-1", "team-a", "ci", hash_secret("s3cret"), ["chat"], 1)]])
    return keypair.hex


REPLICA = re.compile(r"Replica ([0-9a-f]{64}) \((\w+)\) listening on (\S+):(\d+)")
#: Nothing answers there: the replica starts without DHT peers (after waiting for
#: them: a daemon that runs uses a DHT node of the test's, ``dht_node``).
NOWHERE = "127.0.0.1:9"


def comparable(document: dict) -> tuple:
    writers = [(w["key"], w["length"], w["head"], w["admin"], w["admitted"])
               for w in document["writers"]]
    return writers, document["rows"]


async def test_two_replica_processes_converge_and_their_status_agrees(tmp_path):
    """The creator's db serve reads its config file (storage, bootstrap, host...), the
    environment beating the file's host, and holds its folder against a second serve;
    the other replica is admitted, both converge and agree; the creator removes it; each
    stops on its signal (SIGTERM, SIGINT) with exit 0."""
    app_storage, proxy_storage = tmp_path / "app", tmp_path / "proxy"
    creator = seed_creator(app_storage)
    proxy_key = load_or_create_keypair(proxy_storage).hex
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            bootstrap = await dht_node(nursery)
            config = tmp_path / "db.toml"
            config.write_text(f'storage = "{app_storage}"\nbootstrap = ["{bootstrap}"]\n'
                              'host = "127.0.0.2"\nfsync = "never"\nlog_level = "info"\n')
            app = await stack.enter_async_context(process(
                "db", "serve", "--config", str(config), "--allow", proxy_key,
                stdout=subprocess.PIPE, env=dict(os.environ, COSMICAC_DB__HOST="127.0.0.1")))
            printed = await read_until(app.stdout, re.compile(r"Database ([0-9a-f]{64})"))
            # The creator's key is the database's key: the file's storage was opened.
            assert printed[1] == creator
            listening = await read_until(app.stdout, REPLICA)
            assert listening[2] == "admin"
            assert listening[3] == "127.0.0.1"  # the environment's host, not the file's
            # One folder, one daemon: a second serve on it (in this process) is refused.
            code, _, err = await cosmicac("db", "serve", "--storage", str(app_storage),
                                          "-b", NOWHERE)
            assert code == 1
            assert err.strip() == (f"error: storage folder {app_storage.resolve()} is in use "
                                   f"by process {app.pid}; give each daemon its own --storage")
            proxy = await stack.enter_async_context(process(
                "db", "serve", "--storage", str(proxy_storage), "--bootstrap", bootstrap,
                "--host", "127.0.0.1", stdout=subprocess.PIPE,
                env=dict(os.environ, PROXY_AUTOBASE_KEY=printed[1])))
            # Read-only at first, then admitted by the creator (its --allow holds our key).
            await read_until(proxy.stdout, re.compile(
                rf"reader \(not admitted\)[\s\S]*Admitted as a writer of {creator}"))

            while True:  # bounded by fail_after
                app_status, proxy_status = await status(app_storage), await status(proxy_storage)
                admitted = {w["key"] for w in app_status["writers"] if w["admitted"]}
                # The daemons rewrite their peer lists every second: wait for those too.
                peers = ([p["key"] for p in app_status["peers"]],
                         [p["key"] for p in proxy_status["peers"]])
                if (proxy_key in admitted and peers == ([proxy_key], [creator])
                        and comparable(app_status) == comparable(proxy_status)):
                    break
                await trio.sleep(0.2)
            assert app_status["bootstrap"] == proxy_status["bootstrap"] == creator
            assert app_status["rows"]["token_usage"] == 1
            assert app_status["rows"]["model_masters"] == app_status["rows"]["api_keys"] == 1
            for storage in (app_storage, proxy_storage):
                code, out, err = await cosmicac("db", "verify", "--storage", str(storage))
                assert code == 0, out + err

            # The operator removes the proxy through the running creator.
            code, out, err = await cosmicac("db", "remove-writer", proxy_key,
                                            "--storage", str(app_storage))
            assert code == 0, err
            assert re.search(r"removed [0-9a-f]{64}: its first 0 entries go on counting "
                             r"\(via daemon pid \d+\)", out)
            app_status = await status(app_storage)
            assert any(w["key"] == proxy_key and w["cap"] == 0 for w in app_status["writers"])
            # A removed writer reads no more: the creator refuses its pulls.
            await read_until(proxy.stderr, re.compile(r"crdt\.read_refused_by_peer"))
            for replica, signum in ((app, signal.SIGTERM), (proxy, signal.SIGINT)):
                replica.send_signal(signum)
                assert await replica.wait() == 0


async def test_a_reader_replica_replicates_and_a_replica_on_no_list_gets_nothing(
        tmp_path, caplog):
    """Readers, as an operator runs them: the creator (``db serve --reader``, a
    process) serves its --reader (a backup) and nobody else; the other replica's
    status shows none of the data. The two replicas that ask run in this process
    on swarms of their own, as ``db serve`` runs one (the group's processes are
    the creator here and the replicas of the test above)."""
    caplog.set_level(logging.INFO, logger="crdt")
    creator_storage, reader_storage, other_storage = (tmp_path / n for n in ("a", "r", "o"))
    creator = seed_creator(creator_storage)
    reader_key = load_or_create_keypair(reader_storage).hex
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            bootstrap = await dht_node(nursery)
            await stack.enter_async_context(process(
                "db", "serve", "--storage", str(creator_storage), "--bootstrap", bootstrap,
                "--host", "127.0.0.1", "--reader", reader_key))
            for storage in (other_storage, reader_storage):
                await replica_here(nursery, storage, bootstrap, bytes.fromhex(creator))
            while True:  # bounded by fail_after
                # Until the reader has pulled, its view holds nothing yet.
                reader_status = await status(reader_storage)
                rows = reader_status.get("rows") or {}
                if rows.get("token_usage") == 1:
                    break
                await trio.sleep(0.2)
            assert reader_status["rows"]["api_keys"] == 1  # the key inventory arrived
            # The other replica was refused: its pulls say so, and it holds nothing.
            other_key = load_or_create_keypair(other_storage).public_key
            await wait_until(lambda: refused(caplog, other_key, by=creator), limit_s=60)
            other_status = await status(other_storage)
            assert other_status["rows"]["api_keys"] == other_status["rows"]["token_usage"] == 0
            assert all(w["length"] == 0 for w in other_status["writers"])


async def replica_here(nursery: trio.Nursery, storage, bootstrap: str, key: bytes) -> None:
    """A replica of the database ``key`` in this process, on its own swarm joined to
    the DHT at ``bootstrap``, as ``db serve`` starts one (cli/db.py's ``_start``)."""
    keypair = load_or_create_keypair(storage)
    host, port = bootstrap.rsplit(":", 1)
    swarm = Swarm(keypair, config=SwarmConfig(host="127.0.0.1", port=0,
                                              bootstrap=((host, int(port)),)))
    await nursery.start(swarm.run)
    await nursery.start(functools.partial(
        run_database_service, storage, swarm=swarm, bootstrap=key,
        fsync=FsyncPolicy.NEVER, replication=ReplicationConfig()))


def refused(caplog, key: bytes, by: str) -> bool:
    """Whether the replica of ``key`` logged that the replica ``by`` (hex) refused its
    pulls (the line ``db serve`` prints on its stderr; the reason names the caller)."""
    return any(message.startswith(f"crdt.read_refused_by_peer peer={by[:12]} ")
               and f"{format_key(key)} may not read" in message
               for message in (record.getMessage() for record in caplog.records))


async def test_verify_names_the_damaged_file_and_offset_and_exits_1(tmp_path):
    seed_creator(tmp_path)
    def files():
        # SQLite's own -wal/-shm companions appear when anyone reads a WAL database.
        return {path: path.read_bytes() for path in tmp_path.rglob("*")
                if path.is_file() and not path.name.endswith(("-wal", "-shm"))}

    before = files()
    code, out, _ = await cosmicac("db", "verify", "--storage", str(tmp_path))
    assert code == 0 and "ok:" in out
    document = await status(tmp_path)
    assert document["writers"][0]["length"] == 202 and document["daemon_pid"] is None
    assert document["writers"][0]["counted"] == document["writers"][0]["applied"] == 202
    # Looking changes nothing (no log, metadata or view file created, rewritten or cut).
    assert files() == before
    (log_file,) = (tmp_path / "db" / "logs").glob("*.log")
    data = bytearray(log_file.read_bytes())
    data[len(data) // 3] ^= 0x01
    log_file.write_bytes(bytes(data))
    code, out, err = await cosmicac("db", "verify", "--storage", str(tmp_path))
    assert code == 1
    assert re.search(rf"{re.escape(str(log_file))} at byte \d+", out + err)


async def test_status_of_a_folder_without_a_database_is_a_clear_error(tmp_path):
    code, _, err = await cosmicac("db", "status", "--storage", str(tmp_path))
    assert code == 1
    assert "holds no database" in err


async def test_writers_are_added_and_removed_offline_with_clear_refusals(tmp_path):
    creator = seed_creator(tmp_path / "app")
    other = load_or_create_keypair(tmp_path / "other").hex
    storage = ("--storage", str(tmp_path / "app"))
    code, out, _ = await cosmicac("db", "add-writer", other, *storage)
    assert code == 0 and f"added {other} as a writer (via storage)" in out
    code, out, _ = await cosmicac("db", "add-writer", other, *storage)
    assert code == 0 and "is a writer already" in out
    document = await status(tmp_path / "app")
    assert any(w["key"] == other and w["admitted"] for w in document["writers"])
    code, out, _ = await cosmicac("db", "remove-writer", other, *storage)
    assert code == 0 and "its first 0 entries go on counting" in out
    code, _, err = await cosmicac("db", "add-writer", other, *storage)
    assert code == 1 and "REMOVED" in err
    code, _, err = await cosmicac("db", "add-writer", "not-a-key", *storage)
    assert code == 2
    # The only admin removing itself would leave a database nobody can administer.
    code, _, err = await cosmicac("db", "remove-writer", creator, *storage)
    assert code == 1 and "LAST_ADMIN" in err and len(err.strip().splitlines()) == 1
    assert any(w["key"] == creator and w["admin"] and w["admitted"]
               for w in (await status(tmp_path / "app"))["writers"])
    # Only an admin may: the other replica's own folder holds no admin of anything.
    code, _, err = await cosmicac("db", "add-writer", other, "--storage", str(tmp_path / "other"))
    assert code == 1 and "holds no database" in err


async def test_removing_the_only_admin_is_refused_and_allowed_once_there_is_another(tmp_path):
    me = seed_creator(tmp_path / "app")
    other = load_or_create_keypair(tmp_path / "other").hex
    storage = ("--storage", str(tmp_path / "app"))
    code, _, err = await cosmicac("db", "remove-writer", me, *storage)
    assert code == 1
    assert "LAST_ADMIN" in err and "is the only admin" in err
    assert [(w["key"], w["admitted"]) for w in (await status(tmp_path / "app"))["writers"]] == [
        (me, True)]
    code, _, _ = await cosmicac("db", "add-writer", other, "--admin", *storage)
    assert code == 0
    code, _, err = await cosmicac("db", "remove-writer", me, *storage)
    assert code == 0, err


# -- db serve on the daemon kit ---------------------------------------------------------


def test_db_serve_bad_settings_name_their_key_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    cases = [
        ({"COSMICAC_DB__PORT": "70000"}, [],
         "error: bad setting port (from COSMICAC_DB__PORT): Input should be less than or "
         "equal to 65535, got '70000'"),
        ({"COSMICAC_DB__RELAYS": '["zz"]'}, [],
         "error: bad setting relays[0] (from COSMICAC_DB__RELAYS): a public key is 64 hex "
         "characters, got 2: 'zz'"),
        ({"COSMICAC_DB__FSYNC": "sometimes"}, [],
         "error: bad setting fsync (from COSMICAC_DB__FSYNC): Input should be 'always' or "
         "'never', got 'sometimes'"),
        ({"PROXY_AUTOBASE_KEY": "abc"}, [],
         "error: bad setting key (from PROXY_AUTOBASE_KEY): a public key is 64 hex "
         "characters, got 3: 'abc'"),
        ({}, ["--storage", str(tmp_path)],
         "error: bad setting bootstrap: required: set it in the config file, as "
         "COSMICAC_DB__BOOTSTRAP, or with its option"),
    ]
    for env, args, line in cases:
        base = {"COSMICAC_DB__STORAGE": str(tmp_path), "COSMICAC_DB__BOOTSTRAP": NOWHERE}
        if not args:
            env = {**base, **env}
        result = runner.invoke(app, ["db", "serve", *args], env=env)
        assert result.exit_code == 2, (env, result.output)
        assert result.output.strip() == line


def test_db_serve_names_a_storage_file_it_cannot_use_instead_of_cannot_listen(tmp_path):
    (tmp_path / "db").write_text("a file where the replica keeps a folder")
    # In this process, on the main thread (serve takes its signals there before it
    # opens the storage); the DHT node it joins runs in a thread of its own.
    with dht_node_in_a_thread() as bootstrap:
        ran = invoke(["db", "serve", "--storage", str(tmp_path), "-b", bootstrap,
                      "--host", "127.0.0.1"])
    code, err = ran.returncode, ran.stderr.decode()
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        f"error: cannot use {tmp_path / 'db' / 'logs'}: Not a directory")
    assert "cannot listen" not in err and "Traceback" not in err


@contextmanager
def dht_node_in_a_thread() -> Iterator[str]:
    """:func:`dht_node` in its own trio run on a thread; its HOST:PORT while it runs."""
    found: queue.Queue[tuple[str, trio.lowlevel.TrioToken, trio.CancelScope]] = queue.Queue()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            found.put((await dht_node(nursery), trio.lowlevel.current_trio_token(),
                       nursery.cancel_scope))

    thread = threading.Thread(target=trio.run, args=(run,), daemon=True)
    thread.start()
    address, token, scope = found.get(timeout=30)
    try:
        yield address
    finally:
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(timeout=30)
        assert not thread.is_alive()


async def test_add_writer_takes_the_identity_from_another_folder(tmp_path):
    # app-node keeps its identity in its storage and the database in <storage>/db.
    seed_creator(tmp_path / "app")
    (tmp_path / "id").mkdir()
    (tmp_path / "app" / "identity").rename(tmp_path / "id" / "identity")
    other = load_or_create_keypair(tmp_path / "other").hex
    storage = ("--storage", str(tmp_path / "app"))
    code, _, err = await cosmicac("db", "add-writer", other, *storage)
    assert code == 1 and "no usable identity" in err
    code, out, _ = await cosmicac("db", "add-writer", other, *storage,
                                  "--identity", str(tmp_path / "id"))
    assert code == 0 and f"added {other} as a writer" in out
