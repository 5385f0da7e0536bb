// A compile error: a missing semicolon.
public class Main {
    public static void main(String[] args) { System.out.println(0) }
}
