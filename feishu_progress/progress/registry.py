"""The registry of live cards of this process, by session id and by message id."""

from __future__ import annotations

from collections.abc import Iterator

from feishu_progress.metrics import Metrics
from feishu_progress.progress.live_card import LiveCard


class LiveCardRegistry:
    """Live cards by session id (the runtime API) and by message id (card callbacks)."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        self._by_session: dict[int, LiveCard] = {}
        self._by_message: dict[str, LiveCard] = {}

    def add(self, card: LiveCard) -> None:
        """Register ``card``, replacing any earlier card of the same session."""
        self.remove(card.session_id)
        self._by_session[card.session_id] = card
        self._by_message[card.message_id] = card
        self._publish()

    def get(self, session_id: int) -> LiveCard | None:
        """The card of a session, if live here."""
        return self._by_session.get(session_id)

    def by_message(self, message_id: str) -> LiveCard | None:
        """The card living in a Feishu message, if live here."""
        return self._by_message.get(message_id)

    def remove(self, session_id: int) -> LiveCard | None:
        """Unregister a session's card and return it."""
        card = self._by_session.pop(session_id, None)
        if card is not None:
            self._by_message.pop(card.message_id, None)
            self._publish()
        return card

    def __len__(self) -> int:
        return len(self._by_session)

    def __iter__(self) -> Iterator[LiveCard]:
        return iter(list(self._by_session.values()))

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_session

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.live_cards.set(len(self._by_session))
