"""The garbage collector's settings for the long-lived service process.

CPython's defaults (700, 10, 10) suit short scripts. Under load the service allocates fast: an event batch
builds a few hundred objects that live until its request ends, so with a young generation of 700 many of
them are still alive at a collection, get promoted, and soon trigger a full collection — which walks every
object of every live card. Measured at 1,000 live cards and ~18,000 events/s on one core (bench/load.py
``--pin``): ~35 full collections in 30 s, ~170 ms each, **20 % of the service's CPU**. With the settings
below the same run spends ~1 % there.

- A young generation of 50,000 objects: by the time it is collected almost every batch's objects have
  been freed by reference counting, so little is promoted. It holds at most a few MB of cyclic garbage.
- 20 young collections per middle one, 10 middle ones per full one: under that load a full collection is
  due every ~15 minutes (still guarded by CPython's rule that a quarter of the old objects must be new),
  so cyclic garbage that reaches the old generation is still reclaimed in a long-lived process.
- What exists once the app has started (modules, schemas, the restored cards) is frozen out of the
  collector's walks: it lives as long as the process. Reference counting still frees it.
"""

from __future__ import annotations

import gc

from aiohttp import web

SERVICE_THRESHOLDS = (50_000, 20, 10)


def settle_after_startup(app: web.Application) -> None:
    """Tune the collector once ``app`` has started (after its own startup: the restored cards included)."""
    app.on_startup.append(_settle)


async def _settle(app: web.Application) -> None:
    gc.collect()  # what startup left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(*SERVICE_THRESHOLDS)
