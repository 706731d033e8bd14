"""Prompts of the toy task for the serving tests."""

PROMPTS = ["Lily has 3 eggs. She buys 4 more. How many eggs?\n", "Ben has 9 cars. He gives away 2.\n",
           "Zoe has 5 shells and 6 more.\n", "Leo has 1 coin.\n"]
