"""Where facts come from outside the operator: model facts (the Hub, configURL), vLLM's metrics (pods,
Prometheus), and the fetch rules every such GET follows (http(s), no redirects, deadlines, byte caps)."""
