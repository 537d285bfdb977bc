"""Publish a goal to agentfleet from any AMQP client (here plain pika) and wait for its Result."""

import json
import sys
import uuid

import pika

agent, goal = sys.argv[1] if len(sys.argv) > 1 else "repo_report", {"path": "agentfleet"}
connection = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F"))
channel = connection.channel()
reply_queue = channel.queue_declare(queue="", exclusive=True).method.queue
correlation_id = uuid.uuid4().hex
body = {"agent": agent, "input": goal, "goal_id": correlation_id, "limits": {"max_steps": 10}}
channel.basic_publish(
    exchange="agentfleet.inbox", routing_key=f"goal.{agent}", body=json.dumps(body),
    properties=pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                    reply_to=reply_queue, correlation_id=correlation_id),
)
for _method, props, result in channel.consume(reply_queue, auto_ack=True, inactivity_timeout=120):
    if props is None or props.correlation_id == correlation_id:
        print(json.dumps(json.loads(result), indent=2) if result else "no Result within 120 s")
        break
connection.close()
