/* A compile error: a missing semicolon. */
int main(void) { return 0 }
