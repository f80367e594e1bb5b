"""Kafka topics the engine writes: exactly-once transactional writes and the reads that fold them back."""
