"""LoRA adapters from cloud storage (`s3://`, `gs://`): downloaded once per node.

`NodeCache.fetch(url)` gives a local directory holding the objects under `url/`. The
directory is `<root>/<adapter>-<hash of the url>`: when it exists, another replica on
this node (or an earlier load) downloaded it, and it is returned at once. Otherwise,
under an exclusive lock file (one download per node, whichever replicas ask), the
objects are written into a temporary sibling and renamed into place: a reader sees the
whole adapter or nothing, and a failed download leaves nothing behind. Bounded: an
adapter of more than MAX_ADAPTER_FILES objects or MAX_ADAPTER_BYTES is refused before
anything is written, and the cache keeps the MAX_CACHED adapters used last (an adapter
is read once, when an engine loads it). A try that fails is retried
(`max_download_tries`, backoff doubling from 1 s), each within `download_timeout_s`;
an empty prefix is an `AdapterError` at once (HTTP 404). The clients are optional
dependencies (boto3, google-cloud-storage): a missing one is a ConfigError naming the
URL and the package, raised when the server starts.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, Protocol

from surge.errors import ConfigError
from surge.llm.engine import AdapterError

__all__ = ["CLOUD_SCHEMES", "MAX_ADAPTER_BYTES", "MAX_ADAPTER_FILES", "MAX_CACHED",
           "NodeCache", "ObjectStore", "default_root", "store_for"]

CLOUD_SCHEMES = ("s3://", "gs://")
# LoRA adapters are megabytes to a few GiB; more is not an adapter (or not one dir).
MAX_ADAPTER_BYTES = 8 << 30
MAX_ADAPTER_FILES = 1000
# Adapters kept on a node's disk; older ones are removed (engines read them on load).
MAX_CACHED = 256
_PACKAGES = {"s3://": ("boto3", "boto3"), "gs://": ("google.cloud.storage",
                                                     "google-cloud-storage")}


class ObjectStore(Protocol):
    """One cloud's objects: list a prefix, download one object to a file."""

    def list(self, bucket: str, prefix: str) -> list[tuple[str, int]]: ...

    def download(self, bucket: str, key: str, path: str) -> None: ...


def default_root() -> str:
    """Per user, on the node's temporary disk, as Ray's /tmp/ray/llm/lora/cache."""
    return os.path.join(tempfile.gettempdir(), f"surge-{os.getuid()}", "lora")


def _split(url: str) -> tuple[str, str, str]:
    scheme, rest = url[:5], url[5:]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{url}: no bucket in the LoRA adapter's URL")
    return scheme, bucket, key.strip("/") + "/" if key.strip("/") else ""


def store_for(url: str) -> ObjectStore:
    """The client for `url`'s scheme; ConfigError naming the package when it is missing."""
    scheme = url[:5]
    module, package = _PACKAGES[scheme]
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"LoRA adapters from {url} need the optional dependency "
                          f"{package!r}, which is not installed: pip install "
                          f"{package}") from None
    return _S3() if scheme == "s3://" else _GCS()


class _S3:
    """boto3's default chain: credentials, region, and `AWS_ENDPOINT_URL` from the
    environment (a local S3-compatible server in the tests)."""

    def __init__(self) -> None:
        boto3: Any = importlib.import_module("boto3")
        self.client: Any = boto3.client("s3")

    def list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                      Prefix=prefix)
        return [(item["Key"], int(item["Size"])) for page in pages
                for item in page.get("Contents", ())]

    def download(self, bucket: str, key: str, path: str) -> None:
        self.client.download_file(bucket, key, path)


class _GCS:
    """google-cloud-storage's default credentials (`STORAGE_EMULATOR_HOST` honoured)."""

    def __init__(self) -> None:
        storage: Any = importlib.import_module("google.cloud.storage")
        self.client: Any = storage.Client()

    def list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        return [(blob.name, int(blob.size or 0))
                for blob in self.client.list_blobs(bucket, prefix=prefix)]

    def download(self, bucket: str, key: str, path: str) -> None:
        self.client.bucket(bucket).blob(key).download_to_filename(path)


class NodeCache:
    """Adapters downloaded to this node's disk, shared by its replicas."""

    def __init__(self, root: str | None = None, *, tries: int = 3,
                 timeout_s: float | None = 30.0, max_cached: int = MAX_CACHED,
                 stores: Callable[[str], ObjectStore] = store_for,
                 backoff_s: float = 1.0) -> None:
        self.root = root or default_root()
        self.tries = max(1, tries)
        self.timeout_s = timeout_s
        self.max_cached = max_cached
        self.stores = stores
        self.backoff_s = backoff_s
        self.downloads = 0  # adapters this process downloaded (not found on disk)

    def __repr__(self) -> str:
        return f"<NodeCache {self.root} downloads={self.downloads}>"

    def path_for(self, url: str) -> str:
        name = url.rstrip("/").rsplit("/", 1)[-1].replace(":", "_") or "adapter"
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        return os.path.join(self.root, f"{name}-{digest}")

    async def fetch(self, url: str) -> str:
        """The local directory of the adapter at `url` (downloaded if not on disk)."""
        path = self.path_for(url)
        if os.path.isdir(path):
            _touch(path)
            return path
        delay = self.backoff_s
        for attempt in range(1, self.tries + 1):
            try:
                return await asyncio.wait_for(asyncio.to_thread(self._fetch, url, path),
                                              self.timeout_s)
            except (AdapterError, ConfigError):
                raise
            except Exception as exc:
                if attempt == self.tries:
                    raise AdapterError(f"downloading the adapter {url} failed after "
                                       f"{attempt} tries: {type(exc).__name__}: {exc}"
                                       ) from None
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _fetch(self, url: str, path: str) -> str:
        os.makedirs(self.root, exist_ok=True)
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node
            if not os.path.isdir(path):  # (another replica's download finished first)
                self._download(url, path)
                self.downloads += 1
                self._evict(keep=path)
            _touch(path)
        return path

    def _download(self, url: str, path: str) -> None:
        _, bucket, prefix = _split(url)
        store = self.stores(url)
        objects = [(key, size) for key, size in store.list(bucket, prefix)
                   if not key.endswith("/")]
        if not objects:
            raise AdapterError(f"no adapter at {url}: nothing under that prefix")
        total = sum(size for _, size in objects)
        if len(objects) > MAX_ADAPTER_FILES or total > MAX_ADAPTER_BYTES:
            raise AdapterError(f"the adapter at {url} has {len(objects)} objects, {total} "
                               f"bytes: over the bounds ({MAX_ADAPTER_FILES} objects, "
                               f"{MAX_ADAPTER_BYTES} bytes)")
        partial = tempfile.mkdtemp(prefix=".partial-", dir=self.root)
        try:
            for key, _ in objects:
                relative = key[len(prefix):]
                target = os.path.normpath(os.path.join(partial, relative))
                if not target.startswith(partial + os.sep):
                    raise AdapterError(f"{url}: object {key!r} lies outside the adapter")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                store.download(bucket, key, target)
            os.rename(partial, path)  # atomic: all of it or nothing
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _evict(self, keep: str) -> None:
        entries = []
        for name in os.listdir(self.root):
            full = os.path.join(self.root, name)
            if name.startswith(".") or name.endswith(".lock") or full == keep:
                continue
            try:
                entries.append((os.stat(full).st_mtime, full))
            except FileNotFoundError:
                continue
        entries.sort()
        for _, full in entries[:max(0, len(entries) + 1 - self.max_cached)]:
            shutil.rmtree(full, ignore_errors=True)


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass
