"""Every adaptation of kopf in one place: toggles (readiness gates), persistence (progress and diff-base
storage), peering (the lease between operator replicas)."""
