"""The progress card: pure functions from a CardModel to Feishu card JSON 2.0."""
