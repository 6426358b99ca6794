"""Alembic migrations, shipped inside the package so an installed ``feishu-progress migrate`` finds them."""
