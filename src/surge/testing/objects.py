"""`FakeObjectStore`: cloud object storage in memory (`surge.llm.lora_cloud.ObjectStore`).

Objects are `{(bucket, key): bytes}`; `fail_times` makes the next downloads raise
OSError (a flaky network), and `downloads` records each object fetched: for the node
cache's own tests (retries, bounds, eviction), failures a real server does not make on
cue. The clouds' clients are tested against local servers (tests/llm/test_lora_cloud.py).
"""

from __future__ import annotations

__all__ = ["FakeObjectStore"]


class FakeObjectStore:
    def __init__(self, objects: dict[tuple[str, str], bytes] | None = None, *,
                 fail_times: int = 0) -> None:
        self.objects = dict(objects or {})
        self.fail_times = fail_times
        self.downloads: list[tuple[str, str]] = []

    def __repr__(self) -> str:
        return f"<FakeObjectStore objects={len(self.objects)} downloads={len(self.downloads)}>"

    def list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        return sorted((key, len(data)) for (b, key), data in self.objects.items()
                      if b == bucket and key.startswith(prefix))

    def download(self, bucket: str, key: str, path: str) -> None:
        if self.fail_times > 0:
            self.fail_times -= 1
            raise OSError("the fake store was told to fail")
        self.downloads.append((bucket, key))
        with open(path, "wb") as out:
            out.write(self.objects[(bucket, key)])
