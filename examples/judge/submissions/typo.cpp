// A compile error: a missing semicolon.
int main() { return 0 }
