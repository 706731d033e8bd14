"""Prompts of the toy task for the serving tests (each fits the served checkpoint's 48-token
prompt region: its tokenizer reads one character a token)."""

PROMPTS = ["Lily has 3 eggs. She buys 4 more. How many?\n", "Ben has 9 cars. He gives away 2.\n",
           "Zoe has 5 shells and 6 more.\n", "Leo has 1 coin.\n"]
