"""Cluster mode (``FP_REDIS_URL`` set): the parts several instances share.

Nothing here is imported in single-instance mode; modules that need ``redis`` import it themselves, so
an install without the ``cluster`` extra never sees it.
"""
