"""The attempt pipeline: Celery-free, and run only by workers.

``execution`` takes one attempt to a verdict through the layers; ``runner``
holds it to its time limit on every pool; ``classify`` turns what a tool raised
into a classified failure; ``observe`` reports each attempt; ``poison`` and
``expiry`` decide which messages a worker refuses before Celery reads them;
``streams`` bounds a streamed result. An agent's process loads none of it.
"""

__all__: list[str] = []
