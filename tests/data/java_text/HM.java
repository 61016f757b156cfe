import java.util.*;
public class HM { public static void main(String[] a){
 Scanner s = new Scanner(System.in);
 while (s.hasNextInt()) { int r0 = s.nextInt(), r1 = s.nextInt(); HashMap<Integer,Integer> m = new HashMap<>(r1 - r0);
  for (int r = r0; r < r1; r++) m.put(r, r); StringBuilder b = new StringBuilder();
  for (int k : m.keySet()) b.append(k).append(' '); System.out.println(b.toString().trim()); }
}}
