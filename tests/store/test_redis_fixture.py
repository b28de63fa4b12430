"""The test Redis server is the durable kind the relay insists on, and survives SIGKILL through its AOF."""

import redis


def test_redis_fixture_is_durable_and_replays_its_aof(redis_url, redis_server):
    client = redis.Redis.from_url(redis_url)
    assert client.config_get("appendonly")["appendonly"] == "yes"
    assert client.config_get("appendfsync")["appendfsync"] == "always"
    client.set("k", "v")
    client.close()
    redis_server.restart()  # kill -9, then start on the same port and directory
    client = redis.Redis.from_url(redis_url)
    assert client.get("k") == b"v"
    client.close()
