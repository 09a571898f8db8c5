"""Queue-based autoscaling: read vLLM's queue (metrics), decide (policy, pure), act (actuator).

    metrics source (pods' /metrics | Prometheus) -> policy.decide() -> actuator (replicas, status, events)
"""
