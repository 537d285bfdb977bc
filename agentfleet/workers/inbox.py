"""The inbox's answers: admit a goal or take an approval's answer, or reply and dead-letter the
message with the reason. Never raise.

A message is acked only after its goal.submitted is confirmed by the broker, or after its
rejection is dead-lettered (confirmed too); if the broker connection fails in between,
the message is still unacked and comes back.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu import Message
from kombu.exceptions import OperationalError as BrokerUnreachable

from agentfleet.constants import APPROVAL_RESOLVE_ROUTING_KEY, DOMAIN_ROUTING_PREFIX, GOAL_ROUTING_PREFIX
from agentfleet.errors import AgentfleetError, ApprovalRefused, ErrorCode, GoalRejected
from agentfleet.events.contracts import ApprovalAnswer, ApprovalResolve, Result, parse_plain, plain_object
from agentfleet.events.domain import conflict, external_event, external_event_id, problems
from agentfleet.events.wire import loads_strict
from agentfleet.roles.admission import admit, goal_event
from agentfleet.roles.approvals import resolve
from agentfleet.roles.runtime import Runtime

log = logging.getLogger(__name__)
SHORTSTR = 255  # AMQP short strings (reply_to, correlation_id, routing keys) are at most 255 bytes


class Inbox:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def on_goal(self, message: Message) -> None:
        self._settle(message)

    def on_undecodable(self, message: Message, exc: Exception) -> None:
        """kombu could not decompress or decode the body (an unknown codec, a bomb): answer, don't crash."""
        code = exc.code if isinstance(exc, AgentfleetError) else ErrorCode.MALFORMED_MESSAGE
        reason = exc.message if isinstance(exc, AgentfleetError) else f"body could not be decoded: {exc}"
        self._settle(message, GoalRejected(reason, code=code))

    def on_unroutable(self, message: Message) -> None:
        self._settle(message, GoalRejected(
            f"routing key {_routing_key(message)!r} matches no inbox binding (goals use "
            f"{GOAL_ROUTING_PREFIX}<agent>; answers to approvals use {APPROVAL_RESOLVE_ROUTING_KEY}; domain "
            f"events use {DOMAIN_ROUTING_PREFIX}<name>)",
            code=ErrorCode.UNROUTABLE))

    def _settle(self, message: Message, rejection: GoalRejected | None = None) -> None:
        """Admit (or refuse with ``rejection``), then ack. Whatever fails, the consumer goes on."""
        try:
            try:
                if rejection is not None:
                    raise rejection
                self._admit(message)
            except (GoalRejected, ApprovalRefused) as exc:
                self._reject(message, exc.code, exc.message)
            except BrokerUnreachable:
                raise
            except Exception as exc:
                log.exception("inbox message could not be handled")
                self._reject(message, ErrorCode.INTERNAL, f"admission failed: {type(exc).__name__}: {exc}")
        except BrokerUnreachable:
            log.warning("broker unreachable while answering; the message stays unacked and comes back")
            return
        except Exception:
            # Not even the rejection could be sent: hand the message to the inbox's dead-letter
            # exchange as it is (the broker records why), rather than lose it or stop the consumer.
            log.exception("inbox message could not be answered; rejected to the dead-letter exchange")
            _quietly(message.reject, requeue=False)
            return
        _quietly(message.ack)

    def _admit(self, message: Message) -> None:
        settings = self.rt.settings
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        if len(body) > settings.inbox_max_bytes:
            raise GoalRejected(f"body of {len(body)} bytes is over the inbox limit of {settings.inbox_max_bytes}",
                               code=ErrorCode.MESSAGE_TOO_LARGE)
        reply_to, correlation_id = _reply_address(message)
        if _routing_key(message) == APPROVAL_RESOLVE_ROUTING_KEY:
            self._answer(message, body, reply_to, correlation_id)
            return
        if _routing_key(message).startswith(DOMAIN_ROUTING_PREFIX):
            self._domain_event(message, body)
            return
        goal = admit(self.rt.agents, body, _routing_key(message), max_depth=settings.max_json_depth,
                     encoding=message.content_encoding)
        # A goal_id reused with another input is refused by the planner, which reads the run anyway.
        self.rt.publisher.publish([goal_event(goal, reply_to=reply_to, correlation_id=correlation_id)])

    def _domain_event(self, message: Message, body: bytes) -> None:
        """A domain event from outside: plain JSON (its payload) under ``domain.<name>``. Its id is the
        message's ``message_id``, or derived from its body, so a message delivered twice is one event."""
        settings = self.rt.settings
        name = _routing_key(message)[len(DOMAIN_ROUTING_PREFIX):]
        payload = plain_object(body, settings.max_json_depth, message.content_encoding)
        found = problems(name, payload)
        if found:
            raise GoalRejected(f"domain event {name!r} refused: {'; '.join(found)}", code=ErrorCode.INPUT_INVALID)
        message_id = (message.properties or {}).get("message_id")
        event_id = external_event_id(name, message_id if isinstance(message_id, str) else None, body)
        clash = conflict(event_id, payload, self.rt.store.domain_event(event_id))
        if clash:  # the observer refuses one that races past this look, with a dead letter
            raise GoalRejected(clash, code=ErrorCode.EVENT_CONFLICT)
        self.rt.publisher.publish([external_event(name, event_id, payload)])

    def _answer(self, message: Message, body: bytes, reply_to: str | None, correlation_id: str | None) -> None:
        """An answer to an approval request. Who answered is what the broker vouches for: the ``user_id``
        property, which RabbitMQ checks against the connection's user. The body's ``by`` is the sender's own
        word: kept beside it ("guest (as carol)"), never instead of it; an answer without ``user_id`` is refused."""
        settings = self.rt.settings
        answer = parse_plain(ApprovalResolve, body, max_depth=settings.max_json_depth,
                             encoding=message.content_encoding, what="approval answer")
        by = answerer((message.properties or {}).get("user_id"), answer.by)
        accepted = resolve(self.rt, answer, by)
        if reply_to:
            self.rt.publisher.reply(reply_to, correlation_id, accepted)

    def _reject(self, message: Message, code: ErrorCode, reason: str) -> None:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        reply_to, correlation_id = _reply_address(message)
        if reply_to:
            fields = _fields(body, self.rt.settings.inbox_max_bytes, self.rt.settings.max_json_depth)
            if _routing_key(message) == APPROVAL_RESOLVE_ROUTING_KEY:
                self.rt.publisher.reply(reply_to, correlation_id, ApprovalAnswer.rejection(
                    code, reason, run_id=fields.get("run_id"), call_id=fields.get("call_id")))
            else:
                self.rt.publisher.reply(reply_to, correlation_id, Result.rejection(
                    code, reason, agent=fields.get("agent"), goal_id=fields.get("goal_id")))
        props = message.properties or {}
        headers = dict(message.headers or {})
        if not message.errors:  # kombu decompressed the body we keep: it is no longer compressed
            headers.pop("compression", None)
        self.rt.publisher.dead_letter(
            body, reason=reason, error_code=code, source=f"inbox:{_routing_key(message)}",
            headers=headers, correlation_id=correlation_id,
            original_exchange=self.rt.topology.inbox.name, original_routing_key=_routing_key(message),
            properties={"content_type": message.content_type, "content_encoding": message.content_encoding,
                        "reply_to": reply_to,
                        **{k: props[k] for k in ("user_id", "app_id") if isinstance(props.get(k), str)}},
        )


def _quietly(settle: Any, **kwargs: Any) -> None:
    try:
        settle(**kwargs)
    except Exception:  # the channel is gone: the broker redelivers the message on the next one
        log.warning("ack or reject failed (connection lost); the message comes back")


def _routing_key(message: Message) -> str:
    return str((message.delivery_info or {}).get("routing_key") or "")


def _reply_address(message: Message) -> tuple[str | None, str | None]:
    """reply_to and correlation_id when they can be used as AMQP short strings; else none (not an error)."""
    props = message.properties or {}
    reply_to, correlation_id = props.get("reply_to"), props.get("correlation_id")
    ok_reply = isinstance(reply_to, str) and 0 < len(reply_to.encode(errors="replace")) <= SHORTSTR
    ok_corr = isinstance(correlation_id, str) and len(correlation_id.encode(errors="replace")) <= SHORTSTR
    return (reply_to if ok_reply else None), (correlation_id if ok_corr else None)


def _fields(body: bytes, max_bytes: int, max_depth: int) -> dict[str, str]:
    """The identifying fields of a refused message (a goal's agent and goal_id, an answer's run_id and
    call_id), if its body is JSON enough to have them."""
    if len(body) > max_bytes:
        return {}
    try:
        data = loads_strict(body, max_depth=max_depth)
    except Exception:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v[:200] for k in ("agent", "goal_id", "run_id", "call_id") if isinstance(v := data.get(k), str)}


def answerer(user_id: object, claimed: str | None) -> str:
    """Who answered an approval over AMQP: the broker-checked ``user_id``, with the body's ``by`` beside it when
    it names someone else. Without ``user_id`` nobody vouches for the sender: refused."""
    if not isinstance(user_id, str) or not user_id.strip() or not user_id.isprintable():
        raise ApprovalRefused("an approval answer must carry the user_id property (the broker checks it against "
                              "the connection's user); the body's 'by' alone vouches for nobody",
                              code=ErrorCode.PERMISSION_DENIED)
    return user_id if not claimed or claimed == user_id else f"{user_id} (as {claimed})"

