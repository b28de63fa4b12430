"""What operators watch: the relay's status (lags, peers), Prometheus metrics and structured logs."""
