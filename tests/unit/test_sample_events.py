"""``events/``: one sample event for every function of ``template.yaml`` (``samconfig.toml``: "see events/
for one sample event per trigger"), each one its handler's own event model accepts.

The sample events are what ``sam local invoke -e events/<file>`` and the handler tests start from; a
function without one (the fleet and sharded-assessment tasks had none) leaves an operator guessing the
shape a Step Functions state passes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rightsizer.domain.alertmanager import WebhookPayload
from rightsizer.handler_io import ScheduledTick, parse_drain_task

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"


class _Tagged(yaml.SafeLoader):
    """Accepts CloudFormation short-form tags (!Ref, !Sub, ...)."""


_Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)


def _webhook(event: dict[str, Any]) -> object:
    # A Function URL request: the Alertmanager payload is its body.
    assert event["requestContext"]["http"]["method"] == "POST"
    return WebhookPayload.model_validate_json(event["body"])


def _shard_run(event: dict[str, Any]) -> object:
    from assess.shard import RunEvent

    return RunEvent.model_validate(event)


def _shard(event: dict[str, Any]) -> object:
    from assess.shard import ShardEvent

    return ShardEvent.model_validate(event)


def _fleet(name: str) -> Callable[[dict[str, Any]], object]:
    def parse(event: dict[str, Any]) -> object:
        import fleet.events

        return getattr(fleet.events, name).model_validate(event)

    return parse


#: Handler → (sample event file stem prefix, the parse its handler runs first).
SAMPLES: dict[str, tuple[str, Callable[[dict[str, Any]], object]]] = {
    "assess/app.handler": ("assess-tick", ScheduledTick.model_validate),
    "offhours/app.handler": ("offhours-tick", ScheduledTick.model_validate),
    "drain/app.handler": ("drain-", parse_drain_task),
    "alert_webhook/app.lambda_handler": ("alert-webhook-", _webhook),
    "fleet/app.discover": ("fleet-discover", _fleet("DiscoverEvent")),
    "fleet/app.member": ("fleet-member", _fleet("MemberEvent")),
    "fleet/app.summarize": ("fleet-summarize", _fleet("SummarizeEvent")),
    "assess/shard.prepare": ("shard-prepare", _shard_run),
    "assess/shard.observe": ("shard-observe", _shard),
    "assess/shard.merge": ("shard-merge", _shard_run),
    "assess/shard.release": ("shard-release", _shard_run),
}


def template_handlers() -> set[str]:
    template = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=_Tagged)
    return {
        str(resource["Properties"]["Handler"])
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Serverless::Function"
    }


def samples_of(prefix: str) -> list[Path]:
    return sorted(EVENTS.glob(f"{prefix}*.json"))


def test_every_function_has_a_sample_event_and_every_sample_a_function() -> None:
    assert set(SAMPLES) == template_handlers()
    missing = [handler for handler, (prefix, _) in SAMPLES.items() if not samples_of(prefix)]
    assert missing == []
    claimed = {path for prefix, _ in SAMPLES.values() for path in samples_of(prefix)}
    assert sorted(p.name for p in set(EVENTS.glob("*.json")) - claimed) == []


@pytest.mark.parametrize("handler", sorted(SAMPLES))
def test_the_handler_accepts_its_sample_events(handler: str) -> None:
    prefix, parse = SAMPLES[handler]
    for path in samples_of(prefix):
        parse(json.loads(path.read_text(encoding="utf-8")))


def test_the_check_refuses_a_sample_of_the_wrong_shape() -> None:
    # The shard task's item without its nodes, as a hand-written event might be.
    with pytest.raises(ValueError, match="nodes"):
        _shard({"run": {"id": "r", "at": "2026-11-02T10:00:00Z"}, "shard": {"id": "s0000"}})
