"""The async tier: durable jobs on huey's queue, the OpenAI Batch API, webhook and
e-mail notification, scheduled precompute. See service.py for how it is assembled."""
