import java.io.*; import java.text.*;
public class Oracle { public static void main(String[] a) throws Exception {
 BufferedReader r = new BufferedReader(new InputStreamReader(System.in));
 PrintStream o = new PrintStream(new BufferedOutputStream(System.out), false, "UTF-8");
 DecimalFormat f = new DecimalFormat("#.######");
 String l; while ((l = r.readLine()) != null) {
  if (l.charAt(0) == 'f') { float x = Float.intBitsToFloat((int)Long.parseLong(l.substring(2), 16)); o.println(Float.toString(x)); }
  else { double x = Double.longBitsToDouble(Long.parseUnsignedLong(l.substring(2), 16)); o.println(Double.toString(x) + " " + f.format(x)); }
 }
 o.flush();
}}
