"""aiohttp edge: card callbacks, the runtime API and the admin endpoints."""
