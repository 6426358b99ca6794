"""Live cards and the delivery scheduler that paces and budgets their sends."""
