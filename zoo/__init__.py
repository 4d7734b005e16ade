"""specpilot.zoo: the corpus, tokenizer, tiny target/drafter recipes, shipped micro checkpoints
(checkpoints/) and workloads used by the demo and the tests.
"""
