"""The Celery configuration toolexec derives from its settings."""

from __future__ import annotations

from pathlib import Path

from toolexec.settings import Settings
from toolexec.worker.app import celery_config


def _config(broker: str | None) -> dict[str, object]:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", broker_url=broker, data_dir=Path("/x"))
    return celery_config(settings)


def test_json_is_the_only_content_accepted() -> None:
    """A pickle message from an untrusted producer would run code in the worker."""
    config = _config(None)
    assert config["accept_content"] == ["json"]
    assert config["task_serializer"] == "json"


def test_a_rabbitmq_broker_confirms_every_publish() -> None:
    """An unconfirmed call lost in a RabbitMQ crash would leave its caller waiting."""
    options = _config("amqp://guest:guest@127.0.0.1:5672//")["broker_transport_options"]
    assert options["confirm_publish"] is True  # type: ignore[index]


def test_a_redis_broker_redelivers_before_the_longest_deadline_plus_a_minute() -> None:
    """Messages held by a dead worker come back soon after any call could still be alive."""
    config = _config(None)
    options = config["broker_transport_options"]
    assert options["visibility_timeout"] == Settings(data_dir=Path("/x")).max_timeout + 60  # type: ignore[index]
    assert "confirm_publish" not in options  # type: ignore[operator]


def test_with_the_state_on_a_cluster_celery_gets_the_broker_and_no_result_backend() -> None:
    """Celery has no Redis Cluster backend, and toolexec sends no result through one."""
    settings = Settings(
        redis_url="redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        broker_url="amqp://guest:guest@127.0.0.1:5672//",
        data_dir=Path("/x"),
    )
    config = celery_config(settings)
    assert config["broker_url"] == "amqp://guest:guest@127.0.0.1:5672//"
    assert config["result_backend"] is None
