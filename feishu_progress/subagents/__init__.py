"""Running subagents: the read-only query (``query``), the title rules (``titles``), the manager.

Import the module you need. This package imports nothing itself, so the pure title rules can be used
without loading SQLAlchemy.
"""
