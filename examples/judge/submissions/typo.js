// A compile error: an unclosed parenthesis.
console.log(0;
