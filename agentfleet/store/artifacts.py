"""Artifacts: content a call kept beyond its response limit, stored in chunks and read back by part."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO

from sqlalchemy import Connection, select, update

from agentfleet.constants import RESULT_REF_PREFIX
from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import ARTIFACT_CHUNK, Payload, now


class Artifacts(StoreBase):
    """Kept content, in chunks."""

    def keep_artifacts(self, conn: Connection, *, run_id: str, call_id: str, tool: str,
                       refs: Sequence[dict[str, Any]], payloads: dict[str, Payload]) -> None:
        """Store each artifact's content once (by reference) and link it to the call that produced it.

        Content in bytes is one row; content in a file (a kept work directory) is streamed in
        ``ARTIFACT_CHUNK`` bytes a row, so no worker holds it whole. A reference without content here
        (a cached result served again) is linked only: its content was stored when it was first
        produced, and references are content addresses."""
        at = now()
        for ref in refs:
            content = payloads.get(ref["ref"])
            size = ref.get("size", 0)
            if isinstance(content, bytes | bytearray):
                size = len(content)
                row = {"ref": ref["ref"], "size": size, "media_type": ref.get("media_type", "application/json"),
                       "content": bytes(content), "created_at": at}
                if not self._insert_ignore(conn, T.artifacts, row, ["ref"]) and not self._touch(conn, ref["ref"], at):
                    self._insert_ignore(conn, T.artifacts, row, ["ref"])  # pruned between the two: stored anew
            elif content is not None:
                row = {"ref": ref["ref"], "size": size, "media_type": ref.get("media_type", "application/octet-stream"),
                       "content": None, "created_at": at}
                if self._insert_ignore(conn, T.artifacts, row, ["ref"]) or (
                        not self._touch(conn, ref["ref"], at) and self._insert_ignore(conn, T.artifacts, row, ["ref"])):
                    content.seek(0)
                    for seq, chunk in enumerate(iter(lambda f=content: f.read(ARTIFACT_CHUNK), b"")):
                        conn.execute(T.artifact_chunks.insert().values(ref=ref["ref"], seq=seq, data=chunk))
            self._insert_ignore(conn, T.run_artifacts, {
                "run_id": run_id, "ref": ref["ref"], "call_id": call_id, "tool": tool,
                "kind": ref.get("kind", "output"), "size": size, "created_at": at,
            }, ["run_id", "ref", "call_id"])

    @staticmethod
    def _touch(conn: Connection, ref: str, at: Any) -> bool:
        """Mark stored content as produced again now (under its row's lock), so retention, which deletes unlinked
        content last produced before its cutoff, cannot delete it under this call's link; False: it is gone."""
        a = T.artifacts.c
        return bool(conn.execute(update(T.artifacts).where(a.ref == ref).values(created_at=at)).rowcount)

    def artifact_part(self, run_id: str, ref: str, offset: int, length: int) -> tuple[bytes, int] | None:
        """``length`` bytes of an artifact from ``offset``, and its whole size, if one of this run's calls
        produced it (runs do not read each other's). Reads only the chunks that part lies in.

        ``result:<call id>`` names one of the run's own tool results, as the model was first shown it: the
        context shows an old result compacted to that reference and a head (context/compaction.py), and the
        whole stays in the transcript, stored once."""
        if ref.startswith(RESULT_REF_PREFIX):
            return self._result_part(run_id, ref[len(RESULT_REF_PREFIX):], offset, length)
        a = T.artifacts.c
        stmt = (select(a.size, a.content).join(T.run_artifacts, T.run_artifacts.c.ref == a.ref)
                .where(T.run_artifacts.c.run_id == run_id, a.ref == ref).limit(1))
        with self.reading() as conn:
            row = conn.execute(stmt).first()
            if row is None:
                return None
            size, content = int(row[0]), row[1]
            if content is not None:
                return bytes(content[offset: offset + length]), len(content)
            first, last = offset // ARTIFACT_CHUNK, max(offset, offset + length - 1) // ARTIFACT_CHUNK
            c = T.artifact_chunks.c
            chunks = conn.execute(select(c.data).where(c.ref == ref, c.seq.between(first, last))
                                  .order_by(c.seq)).scalars().all()
        joined = b"".join(bytes(ch) for ch in chunks)
        start = offset - first * ARTIFACT_CHUNK
        return joined[start: start + length], size

    def _result_part(self, run_id: str, call_id: str, offset: int, length: int) -> tuple[bytes, int] | None:
        m = T.messages.c
        with self.reading() as conn:  # only that call's result crosses the wire, not the whole transcript
            bodies = conn.execute(select(m.body).where(m.run_id == run_id, m.position > 0,
                                                       m.body["tool_call_id"].as_string() == call_id)).scalars().all()
        found = next((b.get("content") for b in bodies if isinstance(b, dict) and b.get("role") == "tool"
                      and b.get("tool_call_id") == call_id), None)
        if not isinstance(found, str):
            return None
        content = found.encode()
        return content[offset: offset + length], len(content)

    def artifact_of_run(self, run_id: str, ref: str) -> bytes | None:
        """An artifact's whole content, if one of this run's calls produced it (small ones; ``copy_artifact``
        streams large ones)."""
        found = self.artifact_part(run_id, ref, 0, 1 << 62)
        return found[0] if found is not None else None

    def copy_artifact(self, run_id: str, ref: str, out: BinaryIO) -> bool:
        """Write an artifact of this run to ``out`` a chunk at a time; False when the run has no such artifact."""
        offset = 0
        while True:
            found = self.artifact_part(run_id, ref, offset, ARTIFACT_CHUNK)
            if found is None:
                return False
            part, size = found
            out.write(part)
            offset += len(part)
            if not part or offset >= size:
                return True

    def artifacts_of(self, run_id: str) -> list[dict[str, Any]]:
        """A run's artifacts, in the order its calls produced them: reference, kind, size, tool, call."""
        r = T.run_artifacts.c
        stmt = (select(r.ref, r.kind, r.size, r.tool, r.call_id, r.created_at, T.artifacts.c.media_type)
                .join(T.artifacts, T.artifacts.c.ref == r.ref)
                .where(r.run_id == run_id).order_by(r.created_at, r.call_id))
        with self.reading() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt).all()]
