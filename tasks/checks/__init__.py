"""Built instances checked on targets against the oracle, and the results they leave."""
