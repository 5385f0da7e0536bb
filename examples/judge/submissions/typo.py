# A compile error: an unclosed parenthesis.
print(0
