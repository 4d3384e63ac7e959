"""The client sends through kombu's Redis transport keeping one redis-py client per pool."""

from __future__ import annotations

from toolexec.client.publish import broker_app
from toolexec.client.sending import sending_transport
from toolexec.settings import Settings


def test_a_client_app_on_redis_keeps_one_redis_client_for_its_pool(settings: Settings) -> None:
    """kombu's own channel builds a redis.Redis per command and per publish batch."""
    app = broker_app(settings)
    try:
        assert app.conf.broker_transport == "toolexec.client.sending:SendingTransport"
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            first = channel._create_client()
            with channel.conn_or_acquire() as acquired:
                assert acquired is first
            assert channel._create_client() is first
            assert first.connection_pool is channel.pool
            assert first.ping()
    finally:
        app.close()


def test_only_redis_urls_get_the_sending_transport() -> None:
    assert sending_transport("redis://127.0.0.1:6379/0") is not None
    assert sending_transport("rediss://host:6380/0") is not None
    assert sending_transport("amqp://guest@127.0.0.1//") is None
    assert sending_transport("sentinel://host:26379") is None
