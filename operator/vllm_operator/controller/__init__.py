"""The controller: reconciles a VLLMServer into its children and reports what happened.

reconcile (the Reconciler), kube (the API client it writes through), apierrors (how the API server's refusals
become conditions), events and failures (Events read and written; pods' failures
named), replan (operator upgrades that do not roll the fleet), kvcapacity (the KV cache vLLM allocated, beside
the plan's estimate).
"""
