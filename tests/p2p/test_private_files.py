"""Everything the platform keeps on disk is owner-only, whatever the umask.

:func:`private_folder` and :func:`private_file` are the one way; the table
below opens every store that keeps a secret (identities, the daemons' SQLite
files with their WAL, the shared database's logs and view, the durable queue,
the email outbox with its live links, a storage lock) under umask 000 and
walks what each wrote: no file may be readable by group or others, and no
folder listable by them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from p2p.files import private_file, private_folder

from .helpers import exposed_paths


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most careless operator: every new file and folder would be 0666/0777."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_private_folder_makes_every_missing_folder_owner_only(tmp_path, open_umask):
    made = private_folder(tmp_path / "a" / "b" / "c")
    assert made == tmp_path / "a" / "b" / "c"
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert _mode(folder) == 0o700, folder


def test_private_folder_tightens_an_existing_folder_but_not_its_parents(tmp_path):
    tmp_path.chmod(0o755)
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o755)
    storage.chmod(0o755)
    private_folder(storage)
    assert _mode(storage) == 0o700
    assert _mode(tmp_path) == 0o755  # not ours: a parent the operator chose


def test_private_folder_and_file_never_add_a_permission(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    private_folder(folder)
    assert _mode(folder) == 0o500
    file = tmp_path / "frozen"
    file.write_bytes(b"")
    file.chmod(0o444)
    private_file(file)
    assert _mode(file) == 0o400


def test_private_file_creates_empty_owner_only_and_keeps_the_bytes_of_an_old_one(
        tmp_path, open_umask):
    new = private_file(tmp_path / "new.sqlite")
    assert new.read_bytes() == b"" and _mode(new) == 0o600
    old = tmp_path / "old.sqlite"
    old.write_bytes(b"kept")
    old.chmod(0o644)
    private_file(old)
    assert old.read_bytes() == b"kept" and _mode(old) == 0o600


async def _lock_and_identity(root: Path) -> None:
    from p2p.daemon import lock_storage
    from p2p.keys import load_or_create_keypair

    with lock_storage(root / "daemon"):
        load_or_create_keypair(root / "daemon")


async def _ork_store(root: Path) -> None:
    from nodes.ork.store import Store

    private_folder(root)
    Store.open(root / "ork.sqlite").close()


async def _worker_store(root: Path) -> None:
    from nodes.k8s_worker.store import WorkerStore

    private_folder(root)
    WorkerStore.open(root / "worker.sqlite").close()


async def _app_node_store(root: Path) -> None:
    from nodes.app_node.store import Store

    private_folder(root)
    store = Store.open(root / "app-node.sqlite")
    store.users.create(email="ada@example.com", name="Ada", password_hash="scrypt$secret",
                       now=1.0)
    store.close()


async def _health_store(root: Path) -> None:
    from nodes.app_node.health._store import SqliteHealthStore

    private_folder(root)
    await SqliteHealthStore.open(root / "health.sqlite").aclose()


async def _shared_database(root: Path) -> None:
    from crdt import Database
    from crdt._operations import PutModelMaster
    from p2p.keys import KeyPair

    async with await Database.open(root / "db", KeyPair.generate()) as db:
        await db.append([PutModelMaster("llama", "vllm", {"max_tokens": 16})])


async def _durable_queue(root: Path) -> None:
    from p2p.keys import KeyPair
    from p2p.queue import DurableQueue

    async with await DurableQueue.open(root / "queue", KeyPair.generate(),
                                       KeyPair.generate().public_key) as queue:
        await queue.publish("job-1", b"op")


async def _email_outbox(root: Path) -> None:
    from nodes.app_node.email import EmailKind, EmailMessage, OutboxSender

    sender = OutboxSender(root / "outbox", from_address="noreply@cosmicac.test")
    await sender.send(EmailMessage(
        to=["ada@example.com"], subject="Reset your password",
        text="https://app.example/reset/live-token", html="<p>reset</p>",
        kind=EmailKind.PASSWORD_RESET, idempotency_key="reset:1"))


STORES: dict[str, Callable[[Path], Awaitable[None]]] = {
    "storage lock and identity": _lock_and_identity,
    "wrk-ork store": _ork_store,
    "worker store (report tokens)": _worker_store,
    "app-node store (password hashes)": _app_node_store,
    "app-node health history": _health_store,
    "shared database (logs and view)": _shared_database,
    "durable queue": _durable_queue,
    "email outbox (live links)": _email_outbox,
}


@pytest.mark.parametrize("store", STORES, ids=list(STORES))
async def test_every_secret_store_writes_owner_only_files_whatever_the_umask(
        tmp_path, open_umask, store):
    root = tmp_path / "root"
    await STORES[store](root)
    assert any(root.rglob("*")), "the store wrote nothing: the table proves nothing"
    assert exposed_paths(root) == []


async def test_an_older_deployment_left_open_is_tightened_on_the_next_start(tmp_path):
    from nodes.app_node.store import Store

    storage = tmp_path / "app-node"
    storage.mkdir(mode=0o755)
    storage.chmod(0o755)
    old = storage / "app-node.sqlite"
    Store.open(old).close()
    old.chmod(0o644)
    await _lock_and_identity(tmp_path)  # a daemon's start locks its storage first
    from p2p.daemon import lock_storage

    with lock_storage(storage):
        Store.open(old).close()
    assert _mode(storage) == 0o700
    assert _mode(old) == 0o600


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_storage_path_that_is_no_folder_is_refused_and_left_as_it_was(tmp_path, kind):
    """``--storage /dev/null`` (as root) once chmod'ed /dev/null to 0600 and cut every
    other user off from it: only a folder is ever tightened as a folder."""
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path, 0o666)
    else:
        path.write_bytes(b"")
    path.chmod(0o666)
    with pytest.raises(NotADirectoryError):
        private_folder(path)
    assert _mode(path) == 0o666
    from p2p.errors import IdentityError
    from p2p.keys import load_or_create_keypair

    with pytest.raises(IdentityError):
        load_or_create_keypair(path)
    assert _mode(path) == 0o666


def test_a_database_path_that_is_no_regular_file_is_refused_and_left_as_it_was(tmp_path):
    fifo = tmp_path / "db.sqlite"
    os.mkfifo(fifo, 0o666)
    fifo.chmod(0o666)
    with pytest.raises(OSError, match="not a regular file"):
        private_file(fifo)
    folder = tmp_path / "folder.sqlite"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(OSError):
        private_file(folder)
    assert _mode(fifo) == 0o666 and _mode(folder) == 0o755


def test_a_folder_every_user_shares_is_refused_and_left_as_it_was(tmp_path):
    """``keys show --storage /tmp`` as root once made the host's /tmp 0700."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(PermissionError, match="shared by every user"):
        private_folder(shared)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    inside = private_folder(shared / "mine")  # a folder of its own inside is fine
    assert _mode(inside) == 0o700
