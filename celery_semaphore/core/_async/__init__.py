"""The asyncio semaphore: the hand-written source of both APIs."""
